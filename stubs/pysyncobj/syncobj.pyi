from typing import Any

def monotonicTime() -> float: ...
def createPoller(pollerType: str) -> Any: ...

class SyncObjExceptionWrongVer(Exception):
    ver: int
