"""What differs between the Pythons swamp runs on (3.10 and newer), in one place.

Python 3.10 (Ubuntu 22.04's ``python3``) lacks ``tomllib`` and the built-in exception groups;
their backports (``tomli``, ``exceptiongroup``) are dependencies there only. Trio raises the
backport's groups on 3.10, so a handler must catch that class, not a name 3.10 does not have.
Once 3.10 is dropped, ruff's pyupgrade rules flag these blocks for removal.
"""

import sys

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup

    import tomllib
else:
    import tomli as tomllib
    from exceptiongroup import BaseExceptionGroup

__all__ = ["BaseExceptionGroup", "tomllib"]
