"""Training pipeline for the embedded models: tokenizer, corpus, target, drafters (`python -m xpress_core train`)."""
