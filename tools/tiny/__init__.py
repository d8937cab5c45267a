"""Building blocks of tools/train_tiny.py: the corpus, the tokenizer and the chat data."""
