from typing import Any

pickle: Any
