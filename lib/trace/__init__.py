"""TRACE: grounded VLM captions (captioning), the CLIP-family classifier with caption-relevance
scoring, Gumbel caption selection and learned loss weights (model), and its runs and reports (report)."""
