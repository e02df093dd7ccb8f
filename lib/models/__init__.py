"""Models and backends: chat backends behind one response cache, image-text encoders, the local
llama.cpp server and its LoRA adapter path, MemeWorld's embedded models, paper-smoke's stand-ins,
the serving benchmark and training-memory estimates."""
