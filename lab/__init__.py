"""The lab's measuring tools (lab/README.md): experiments behind the lab log, run as ``python -m lab.NAME``."""
