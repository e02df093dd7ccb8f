"""See, Explain, Intervene: fine-tuned task agents that write silver captions, explanations and
interventions (agents), retrieval-driven few-shot prompting of VLMs (fewshot), and its reports."""
