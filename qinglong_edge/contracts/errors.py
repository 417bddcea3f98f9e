"""The root of the exception tree, and the contract error.

They live here, in the lowest layer, because ``contracts`` imports nothing else of
ours (spec README, "Layers"); :mod:`qinglong_edge.errors` re-exports both and builds
the rest of the tree on :class:`EdgeError`.
"""

from __future__ import annotations

__all__ = ["ContractError", "EdgeError"]


class EdgeError(Exception):
    """Root of every error qinglong-edge raises on purpose.

    Attributes:
        code: stable, machine-readable snake_case reason. Tests and callers match on
            it; the message text is free to change.
        exit_status: the sysexits status the CLI exits with (spec README, "Exit
            statuses"). Subclasses set a default; :data:`qinglong_edge.errors.EXIT_STATUS_BY_CODE`
            refines it per code.
        http_status: the HTTP status hint where the error maps to one, else ``None``.

    Messages never carry secrets (credential secrets, lease tokens, pepper material,
    response bodies): raise sites pass only names, paths and codes.
    """

    code: str = "internal_error"
    exit_status: int = 70  # EX_SOFTWARE
    http_status: int | None = None

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message or self.code
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message != self.code else self.code

    def __reduce__(self) -> tuple[object, ...]:
        # Custom __init__ with keyword-only args: make pickling/copying keep the code.
        return (_rebuild, (type(self), self.message, self.code, dict(self.__dict__)))


def _rebuild(cls: type[EdgeError], message: str, code: str, state: dict[str, object]) -> EdgeError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    err.code = code
    err.message = message
    return err


class ContractError(EdgeError, ValueError):
    """A value failed a wire or on-disk contract.

    Attributes:
        code: the reason, e.g. ``duplicate_key``, ``key_set``, ``digest_mismatch``.
        path: JSON path of the offending value, ``$`` for the document itself, e.g.
            ``$.offer.lease.expiresAtMs`` or ``$.executionRevision.environment[2].name``.

    Raised by every parser and validator in :mod:`qinglong_edge.contracts`; nothing
    else (no ``RecursionError``, ``UnicodeDecodeError`` or bare ``ValueError``)
    escapes them.
    """

    exit_status = 65  # EX_DATAERR
    http_status = 400

    def __init__(self, code: str, path: str = "$", detail: str = "") -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: {detail}" if detail else path, code=code)
