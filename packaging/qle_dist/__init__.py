"""Reproducible builders for the qinglong-edge artefacts (stdlib only).

Run ``python3 packaging/build.py`` (``make dist``). Modules: :mod:`.reproducible`
(tar/gzip/zip writers), :mod:`.payload` (what is shipped), :mod:`.ipk` (OpenWrt
23.05/24.10), :mod:`.tarball` (OpenWrt 25.x and other Linux), :mod:`.zipapp`
(Raspberry Pi). This is a top-level package of its own, not ``packaging``, so it
cannot shadow the PyPI ``packaging`` library pytest imports.
"""
