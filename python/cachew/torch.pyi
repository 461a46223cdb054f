from typing import Any, Dict, Iterator, Optional, Tuple, Union

import torch.utils.data

from . import Dataset

class IterableDataset(torch.utils.data.IterableDataset):
    dataset: Dataset
    seed: Optional[int]
    epoch: int
    writable: bool
    def __init__(self, dataset: Union[Dataset, str], *, seed: Optional[int] = ...,
                 epoch: int = ..., writable: bool = ..., **options: Any) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...
    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __iter__(self) -> Iterator[Union[Tuple[Any, ...], Dict[Union[str, int], Any]]]: ...
