"""What a method costs, as a model of the sync kinds and optimizers (lowcomm.distributed, lowcomm.optim): bytes on the
wire and collectives per worker (bytes), optimizer and sync state per worker (state), modeled time per step and to a
target (wallclock). The models read a method (method) and the parameters' shapes (shapes), never a run.
"""
