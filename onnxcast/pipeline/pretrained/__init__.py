"""The pretrained base forecaster (family ``base``): its corpus, its pretraining and the shipped
weights (docs/pretrained.md)."""
