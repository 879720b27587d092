"""The web's Redis commands are packed by app.core.packer's LeanPacker (its home since the workers use it too)."""

from app.core.packer import LeanPacker, use_lean_packer

__all__ = ["LeanPacker", "use_lean_packer"]
