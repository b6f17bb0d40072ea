"""Text to batches: character ids, the vocabulary, corpora and their sources, the stream batcher, the demo corpus."""
