"""lowcomm: communication-efficient low-rank distributed optimization (LoRDO, Dion, Orth-Dion)."""
