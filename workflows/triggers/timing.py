"""When a schedule fires: a cron expression in a time zone, or a fixed interval.

Fire times are *nominal*: what the expression or the interval names, in UTC, to
the second. A fire is named by its nominal time, however late it actually
starts (jitter, a busy system, a catch-up after downtime): its run's idempotency
key is ``schedule:<id>:<fire time>`` (``fire_key``), so a fire handled twice
starts one run.

- **cron**: five fields (minute, hour, day of month, month, day of week) or six
  (seconds first), as ``cronsim`` reads them: ranges, steps, lists, names of
  months and days, ``L``, ``LW`` and ``#``. The fields are read in the schedule's
  IANA time zone. On daylight-saving changes it does what Debian's cron does: a
  time that a spring change skips fires at the first moment after it, and one
  that an autumn change repeats fires once (expressions with a ``*`` in the
  minute or hour field fire by the clock on both sides). A six-field expression
  fires at its seconds within the minutes the other five name, read so.
- **interval**: every ``interval_s`` seconds, at the whole multiples of it
  since the Unix epoch (UTC): an interval of 60 fires at the start of every
  minute, whatever the time zone. For a fire at a time of day, use cron.

Pure: nothing here reads the database or Redis.
"""

from __future__ import annotations

import functools
import math
import zlib
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from cronsim import CronSim, CronSimError

MAX_CRON_CHARS = 200
MAX_INTERVAL_S = 366 * 24 * 3600
MAX_CATCHUP_WINDOW_S = 7 * 24 * 3600
MAX_JITTER_S = 3600.0
# Fires of a cron schedule counted one by one when it skips a long gap; past this the count stops.
COUNT_CAP = 10_000
_KEY_PREFIX = "schedule:"
_KEY_TIME = "%Y-%m-%dT%H:%M:%SZ"
_ONE_SECOND = timedelta(seconds=1)


# What reading a stored timing may raise on a host that cannot read it (its tzdata lacks the zone,
# its cron library is another version): ``ZoneInfoNotFoundError`` is a ``KeyError``.
UNREADABLE = (LookupError, ValueError, CronSimError)


class TimingError(ValueError):
    """A bad cron expression, interval or time zone: ``errors`` maps each bad field to why."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA time zone names a schedule may name (not the host's own ``localtime``)."""
    return frozenset(zoneinfo.available_timezones() - {"localtime"})


class Skipped(NamedTuple):
    """Fires jumped over: how many, the last of them, and the first fire after them (None: none)."""

    fires: int
    last: datetime | None
    following: datetime | None


@dataclass(frozen=True)
class Timing:
    """A schedule's timing: ``cron`` (in ``timezone``) or ``interval_s``, exactly one of them."""

    cron: str
    interval_s: int | None
    timezone: str = "UTC"

    def after(self, moment: datetime) -> Iterator[datetime]:
        """The fire times strictly after ``moment``, in order, in UTC (ends only if cron never fires again)."""
        if self.interval_s:
            step = self.interval_s
            at = (math.floor(moment.timestamp()) // step + 1) * step
            while True:
                yield datetime.fromtimestamp(at, UTC)
                at += step
        for fire in self._cron_fires(moment):
            # From inside an hour an autumn change repeats, the once-a-day fire of its first pass
            # is found again: it is in the past.
            if fire > moment:
                yield fire

    def next_after(self, moment: datetime) -> datetime | None:
        """The first fire time strictly after ``moment`` (None: it never fires again)."""
        return next(self.after(moment), None)

    def upcoming(self, first: datetime | None, count: int) -> list[datetime]:
        """``first`` and the fire times after it: ``count`` at most."""
        if first is None or count < 1:
            return []
        fires = [first]
        for fire in self.after(first):
            if len(fires) >= count:
                break
            fires.append(fire)
        return fires

    def skip_before(self, fire: datetime, cutoff: datetime) -> Skipped:
        """From the fire time ``fire`` on, the fires before ``cutoff``: how many, the last of them,
        and the first fire that is not before it.

        Exact for an interval (arithmetic). A cron schedule's fires are counted one by one
        up to ``COUNT_CAP``; past it the count says ``COUNT_CAP`` and the rest is jumped over.
        """
        if fire >= cutoff:
            return Skipped(0, None, fire)
        if self.interval_s:
            count = math.ceil((cutoff - fire).total_seconds() / self.interval_s)
            step = timedelta(seconds=self.interval_s)
            return Skipped(count, fire + (count - 1) * step, fire + count * step)
        count, last = 1, fire
        for later in self.after(fire):
            if later >= cutoff:
                return Skipped(count, last, later)
            count, last = count + 1, later
            if count >= COUNT_CAP:
                first = self._first_from(cutoff)
                before = next(self._cron_fires(first or cutoff, reverse=True), None)
                return Skipped(COUNT_CAP, before or last, first)
        return Skipped(count, last, None)  # it never fires again

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def _cron_fires(self, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
        """The cron expression's fire times strictly after ``start`` (before it, ``reverse``), in UTC.

        A six-field expression fires at its seconds within each minute its other five fields name,
        those minutes read as a five-field expression is: so daylight-saving changes move a time of
        day once, as they do without seconds (``cronsim`` reads six fields by the clock: a time an
        autumn change repeats would fire twice, and one a spring change skips not at all)."""
        parts = self.cron.split()
        if len(parts) == 5:
            for fire in CronSim(self.cron, start.astimezone(self.zone), reverse=reverse):
                yield fire.astimezone(UTC)
            return
        seconds = sorted(CronSim(self.cron, start).seconds, reverse=reverse)
        minute = start.replace(second=0, microsecond=0)
        # The minutes from start's on (back from it, reverse), in the five-field reading.
        origin = minute + timedelta(minutes=1) if reverse else minute - _ONE_SECOND
        for named in CronSim(" ".join(parts[1:]), origin.astimezone(self.zone), reverse=reverse):
            for second in seconds:
                fire = named.astimezone(UTC) + timedelta(seconds=second)
                if (fire < start) if reverse else (fire > start):
                    yield fire

    def _first_from(self, moment: datetime) -> datetime | None:
        """The first fire time at or after ``moment``."""
        for fire in self.after(moment - _ONE_SECOND):
            if fire >= moment:
                return fire
        return None


def checked_timing(*, cron: str, interval_s: int | None, timezone: str) -> Timing:
    """A checked ``Timing``: ``TimingError`` naming each bad field (``cron``, ``interval_s``,
    ``timezone``). The cron expression comes back with its whitespace collapsed."""
    cron = " ".join(cron.split())
    errors: dict[str, str] = {}
    if bool(cron) == (interval_s is not None):
        message = "Give either cron or interval_s." if cron else "Give cron or interval_s."
        errors = {"cron": message, "interval_s": message}
    if timezone not in time_zones():
        errors["timezone"] = f"Unknown time zone '{timezone}': give an IANA name such as 'Europe/Paris' or 'UTC'."
    if interval_s is not None and not 1 <= interval_s <= MAX_INTERVAL_S:
        errors["interval_s"] = f"Must be from 1 to {MAX_INTERVAL_S} seconds."
    if cron and "cron" not in errors:
        problem = cron_problem(cron, "UTC" if "timezone" in errors else timezone)
        if problem:
            errors["cron"] = problem
    if errors:
        raise TimingError(errors)
    return Timing(cron=cron, interval_s=interval_s, timezone=timezone)


def cron_problem(cron: str, timezone: str) -> str | None:
    """Why ``cron`` is not a usable expression in ``timezone``, or None."""
    if len(cron) > MAX_CRON_CHARS:
        return f"At most {MAX_CRON_CHARS} characters."
    try:
        fires = CronSim(cron, datetime.now(zoneinfo.ZoneInfo(timezone)))
    except CronSimError as exc:
        return f"Not a cron expression: {_syntax_problem(cron, str(exc))}"
    if next(fires, None) is None:
        return "This expression never fires."
    return None


# The fields of a six-field expression, in order, and what each takes; a five-field one has all but
# the first. Keyed by how cronsim names a bad one ("Bad day-of-week").
_FIELDS = {
    "second": ("the second", "0-59"),
    "minute": ("the minute", "0-59"),
    "hour": ("the hour", "0-23"),
    "day-of-month": ("the day of month", "1-31, and a day that one of the months named has, L (the last day) "
                     "and LW (the last weekday)"),
    "month": ("the month", "1-12 or jan-dec"),
    "day-of-week": ("the day of week", "0-7 or sun-sat (0 and 7 are Sunday), 5L (the last Friday) and MON#2 "
                    "(the second Monday)"),
}
_FIVE = "minute hour day-of-month month day-of-week"


def _syntax_problem(cron: str, refusal: str) -> str:
    """What cronsim's ``refusal`` of ``cron`` ("Bad day-of-week") means, in words: which field, as
    written, and what it takes. Six fields have the seconds first: a year field, as some crons take
    one last, would be read as the day of week."""
    parts = cron.split()
    if len(parts) not in (5, 6):
        return f"it has {len(parts)} fields; give 5 ({_FIVE}) or 6 (second {_FIVE})."
    names = list(_FIELDS)[-len(parts):]
    bad = refusal.removeprefix("Bad ")
    if bad not in names:
        return f"{refusal} (5 fields: {_FIVE}, or 6 with the second first)."
    position = names.index(bad)
    name, takes = _FIELDS[bad]
    message = (f"field {position + 1} of {len(parts)}, {name}, is '{parts[position]}'; it takes {takes}, "
               "with *, ranges, steps and lists.")
    if len(parts) == 6:
        message += f" Six fields are second {_FIVE}: the second comes first, and there is no year field."
    return message


def jitter_delay(schedule_id: str, fire: datetime, jitter_s: float) -> timedelta:
    """How long after its nominal time the fire ``fire`` of a schedule starts: from 0 to ``jitter_s``,
    the same wherever and however often it is computed (a hash of the schedule and the fire)."""
    if jitter_s <= 0:
        return timedelta(0)
    share = zlib.crc32(fire_key(schedule_id, fire).encode()) / 2**32
    return timedelta(seconds=share * jitter_s)


def fire_key(schedule_id: str, fire: datetime) -> str:
    """The idempotency key of a fire: ``schedule:<id>:<fire time, UTC ISO 8601 to the second>``."""
    return f"{_KEY_PREFIX}{schedule_id}:{fire.astimezone(UTC).strftime(_KEY_TIME)}"


def fire_of_key(key: str) -> tuple[str, datetime] | None:
    """The schedule id and the nominal fire time of a fire's idempotency key; None for another key."""
    if not key.startswith(_KEY_PREFIX):
        return None
    schedule_id, _, moment = key.removeprefix(_KEY_PREFIX).partition(":")
    try:
        fire = datetime.strptime(moment, _KEY_TIME).replace(tzinfo=UTC)
    except ValueError:
        return None
    return (schedule_id, fire) if schedule_id else None
