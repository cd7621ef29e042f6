"""Thin Lightning glue: the LightningModule and the training strategies that call the sync engines."""
