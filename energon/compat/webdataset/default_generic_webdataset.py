"""``megatron.energon.flavors.webdataset.default_generic_webdataset``: the factory of samples built
by a field map or a sample loader (``DefaultGenericWebdatasetFactory``, in ``energon.compat.flavors``),
with the helpers the reference's module offers. A module of its own because ``field_access`` here is
the function, while ``flavors.webdataset.field_access`` is a module."""

from __future__ import annotations

from energon.compat.epathlib import EPath
from energon.compat.flavors import BaseWebdatasetFactory, DefaultGenericWebdatasetFactory
from energon.compat.module_loader import ModuleLoader
from energon.compat.webdataset.field_access import field_access, split_field_access
from energon.compat.webdataset.structs import FilteredSample
from energon.format.layout import MAIN_FOLDER_NAME
from energon.loader.savable_dataset import SavableDataset

__all__ = [
    "MAIN_FOLDER_NAME",
    "BaseWebdatasetFactory",
    "DefaultGenericWebdatasetFactory",
    "EPath",
    "FilteredSample",
    "ModuleLoader",
    "SavableDataset",
    "field_access",
    "split_field_access",
]
