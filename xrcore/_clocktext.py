"""Replicated times in words ("2026-12-02 16:05 UTC") without `datetime`, which can read the
clock and so is banned in the core."""

from __future__ import annotations

__all__ = ["utc_text"]

DAY_MS = 86_400_000


def _civil(days: int) -> tuple[int, int, int]:
    """Year, month, day of a count of days since 1970-01-01 (Howard Hinnant's algorithm)."""
    days += 719_468
    era = days // 146_097
    day_of_era = days - era * 146_097
    year_of_era = (
        day_of_era - day_of_era // 1_460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def utc_text(time_ms: float, *, seconds: bool = False) -> str:
    milliseconds = int(time_ms)
    days, within_ms = divmod(milliseconds, DAY_MS)
    year, month, day = _civil(days)
    hour, rest = divmod(within_ms // 1000, 3600)
    minute, second = divmod(rest, 60)
    clock = f"{hour:02d}:{minute:02d}:{second:02d}" if seconds else f"{hour:02d}:{minute:02d}"
    return f"{year:04d}-{month:02d}-{day:02d} {clock} UTC"
