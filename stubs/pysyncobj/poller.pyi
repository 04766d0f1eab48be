class POLL_EVENT_TYPE:
    READ: int
    WRITE: int
    ERROR: int
