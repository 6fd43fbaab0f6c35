"""From a path to batches: building datasets (``build``), the dataset a loader iterates
(``savable_dataset``), the loaders (``data_loader``) and pass-length wrappers (``wrappers``)."""

from energon.loader.build import get_train_dataset, get_val_dataset, get_val_datasets
from energon.loader.data_loader import (
    BasicDataLoader,
    Loader,
    SavableDataLoader,
    get_loader,
    get_savable_loader,
)
from energon.loader.savable_dataset import SavableDataset
from energon.loader.wrappers import LimitDataset, RepeatDataset

__all__ = [
    "BasicDataLoader",
    "LimitDataset",
    "Loader",
    "RepeatDataset",
    "SavableDataLoader",
    "SavableDataset",
    "get_loader",
    "get_savable_loader",
    "get_train_dataset",
    "get_val_dataset",
    "get_val_datasets",
]
