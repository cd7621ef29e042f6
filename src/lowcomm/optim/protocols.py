"""What the sync engine and the trainer may ask of an optimizer beyond torch.optim.Optimizer, as typed protocols
(structural: an optimizer has the capability when it has the members; checked with isinstance)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from lowcomm.optim.collective import AllReduce


@runtime_checkable
class CarriesBasis(Protocol):
    """Low-rank matrices stepped in bases Q (state[p][basis_key]) that the engine may replace: given one matrix per
    basis parameter, Q becomes its top-r basis (same rank and side) and the moments are rotated into it (D4)."""

    basis_key: str

    def basis_params(self) -> list[Tensor]: ...

    def set_bases_from(self, matrices: list[Tensor]) -> None: ...


@runtime_checkable
class SynchronizesItself(Protocol):
    """An optimizer that all-reduces its own messages through the Communicator it is given (None: runs locally),
    and can make its state identical on every rank before a checkpoint."""

    def set_communicator(self, communicator: AllReduce | None) -> None: ...

    def synchronize_for_checkpoint(self) -> None: ...


@runtime_checkable
class CountsStateBytes(Protocol):
    """An optimizer that states its own state bytes by kind (where they are not plain Adam moments)."""

    def state_bytes(self) -> dict[str, int]: ...


@runtime_checkable
class ReportsUpdateRMS(Protocol):
    """An optimizer that reports the RMS of each term of its last measured update; it measures the steps taken while
    `measure_update_rms` is true."""

    measure_update_rms: bool

    def last_update_rms(self) -> dict[str, float]: ...


@runtime_checkable
class ReportsSpectralStats(Protocol):
    """An optimizer that reports spectral statistics of its last update (Dion's nu_t, the active rank): summaries
    over the matrices, and per matrix by name."""

    def spectral_stats(self) -> dict[str, float]: ...

    def spectral_by_matrix(self) -> dict[str, dict[str, float]]: ...
