"""Dataset files for the tests: good/ (one per file type and shape) and bad/ (a corpus of broken files)."""
