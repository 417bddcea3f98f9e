"""`make test-foreign`: the zipapp in Debian bookworm roots of foreign architectures under
qemu-user (tests/foreign/run.py). Not part of `make test`: it needs root, debootstrap,
qemu-user-static with binfmt-support, and network access the first time."""
