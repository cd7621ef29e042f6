"""Thin Lightning glue: the LightningModule and the training strategy that calls the sync engines."""

import warnings

# Deprecation notices from inside Lightning 2.6 that every worker process would print.
for _noise in (".*LeafSpec.*", ".*sync_dist=True.*", ".*all_gather is deprecated.*"):
    warnings.filterwarnings("ignore", _noise)
