"""Cron schedules: the declaration, the slots (time zones and DST), and the
starter a worker's loop asks, on a clock the test controls."""

import datetime as dt
import logging
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from django.db import OperationalError

from everystep import cron, database, operations, registry
from everystep.api import workflow
from everystep.cron import CronSchedule, CronStarter, ScheduleError
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests.helpers import run_once

UTC = dt.UTC
PARIS = ZoneInfo("Europe/Paris")


def at(*args, tz=UTC):
    return dt.datetime(*args, tzinfo=tz)


class Clock:
    """A ``now`` the test moves."""

    def __init__(self, now: dt.datetime):
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def set(self, *args):
        self.now = at(*args)


@pytest.fixture
def declare(cron_workflow):
    return cron_workflow


def runs_of(func):
    return list(Workflow.objects.filter(name=func.__everystep__.name).order_by("idempotency_key"))


def keys_of(func):
    return [run.idempotency_key for run in runs_of(func)]


def started_at(func, starter_now, *, runner="w1"):
    """A starter (a worker's) that has made its first check at ``starter_now``."""
    clock = Clock(starter_now)
    starter = CronStarter([func.__everystep__.cron], runner=runner, now=clock)
    starter.start_due()
    return starter, clock


# ---------------------------------------------------------------- declaring


def test_a_cron_workflow_is_registered_with_its_schedule(declare):
    report = declare(cron="*/5  * * * *", timezone="Europe/Paris")
    spec = report.__everystep__
    assert spec.cron == CronSchedule(spec.name, "*/5 * * * *", "Europe/Paris")  # whitespace normalised
    assert registry.schedules() == [spec.cron]
    assert str(spec.cron) == "*/5 * * * * (Europe/Paris)"
    assert report(at(2026, 1, 1)) == "2026-01-01T00:00:00+00:00"  # outside a run: a plain call


def test_a_workflow_without_options_has_no_schedule(declare):
    assert declare().__everystep__.cron is None
    assert registry.schedules() == []


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("61 * * * *", "Bad minute"),
        ("* * * *", "Wrong number of fields"),
        ("0 9 * * FUNDAY", "Bad day-of-week"),
        ("@daily", "Wrong number of fields"),
        ("", "Wrong number of fields"),
        ("0 0 30 2 *", "Bad day-of-month"),  # 30 February
    ],
)
def test_a_bad_expression_is_refused_at_declaration_naming_the_workflow_and_the_expression(
    declare, expression, problem
):
    with pytest.raises(ScheduleError) as excinfo:
        declare(name="nightly", cron=expression)
    message = str(excinfo.value)
    assert ".flows.nightly: cron=" in message and repr(expression) in message
    assert problem in message
    assert "five fields" in message  # what to write instead
    assert registry.schedules() == []
    assert not [name for name in registry.workflow_names() if name.endswith(".nightly")]


def test_an_expression_that_never_matches_is_refused(declare):
    # The 1st of February that is also its fifth Monday (a star in a day field: both must match).
    with pytest.raises(ScheduleError, match="matches no time in the next 50 years"):
        declare(cron="0 0 */30 2 MON#5")


def test_other_bad_declarations_are_refused(declare):
    with pytest.raises(ScheduleError, match=r"unknown time zone 'Mars/Olympus'.*IANA"):
        declare(cron="0 9 * * *", timezone="Mars/Olympus")
    with pytest.raises(ScheduleError, match="must be a string"):
        declare(cron=5)
    with pytest.raises(EverystepError, match="timezone='Europe/Paris' is the zone of a cron schedule"):
        declare(timezone="Europe/Paris")


def test_a_cron_workflow_must_take_the_slot_as_its_one_argument(scratch_modules):
    def two(slot, other):
        pass

    def none():
        pass

    for func in (two, none):
        func.__module__ = f"{scratch_modules.prefix}.flows"
        with pytest.raises(ScheduleError, match=r"called with one argument, the slot's time"):
            workflow(cron="0 9 * * *")(func)

    def with_default(slot, other=1):
        pass

    with_default.__module__ = f"{scratch_modules.prefix}.flows"
    workflow(cron="0 9 * * *")(with_default)  # takes it


# ---------------------------------------------------------------- slots


def test_slots_in_utc_by_default():
    schedule = CronSchedule("a.b", "*/15 9-10 * * MON-FRI")
    assert schedule.next_after(at(2026, 3, 6, 9, 15)) == at(2026, 3, 6, 9, 30)  # strictly after
    assert schedule.next_after(at(2026, 3, 6, 10, 50)) == at(2026, 3, 9, 9, 0)  # Friday -> Monday
    assert schedule.latest_at(at(2026, 3, 6, 9, 15)) == at(2026, 3, 6, 9, 15)  # at or before
    assert schedule.latest_at(at(2026, 3, 6, 9, 14, 59, 999999)) == at(2026, 3, 6, 9, 0)
    assert schedule.latest_at(at(2026, 3, 9, 8, 0)) == at(2026, 3, 6, 10, 45)
    assert schedule.key(at(2026, 3, 6, 9, 15)) == "cron:2026-03-06T09:15:00Z"
    assert cron.slot_of("cron:2026-03-06T09:15:00Z") == at(2026, 3, 6, 9, 15)
    assert cron.slot_of("order-42") is None and cron.slot_of("cron:garbage") is None
    assert schedule.slots_between(at(2026, 3, 6, 9, 0), at(2026, 3, 6, 10, 0)) == 3  # 9:15, 9:30, 9:45


def test_a_sixth_field_counts_seconds():
    schedule = CronSchedule("a.b", "*/20 * * * * *")
    assert schedule.next_after(at(2026, 1, 1, 0, 0, 5)) == at(2026, 1, 1, 0, 0, 20)


def test_slots_in_a_zone_and_its_argument():
    schedule = CronSchedule("a.b", "0 9 * * *", "Europe/Paris")
    slot = schedule.next_after(at(2026, 1, 10, 12, 0))
    assert slot == at(2026, 1, 11, 8, 0)  # 09:00 CET
    assert schedule.next_after(at(2026, 7, 10, 12, 0)) == at(2026, 7, 11, 7, 0)  # 09:00 CEST
    argument = schedule.argument(slot)
    assert (argument.hour, argument.utcoffset()) == (9, dt.timedelta(hours=1))


def slots(schedule, start, end):
    found, moment = [], start
    while (moment := schedule.next_after(moment)) < end:
        found.append(moment.astimezone(PARIS).strftime("%H:%M%Z"))
    return found


def test_dst_a_fixed_time_in_the_skipped_hour_runs_right_after_the_jump():
    # 2026-03-29 in Paris: 02:00 CET jumps to 03:00 CEST.
    schedule = CronSchedule("a.b", "30 2 * * *", "Europe/Paris")
    assert slots(schedule, at(2026, 3, 27, 12), at(2026, 3, 31)) == ["02:30CET", "03:00CEST", "02:30CEST"]


def test_dst_a_fixed_time_in_the_repeated_hour_runs_once():
    # 2026-10-25 in Paris: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice,
    # the slot once, in the first pass (CEST).
    schedule = CronSchedule("a.b", "30 2 * * *", "Europe/Paris")
    assert slots(schedule, at(2026, 10, 23, 12), at(2026, 10, 27)) == ["02:30CEST", "02:30CEST", "02:30CET"]


def test_dst_frequent_slots_follow_real_time():
    schedule = CronSchedule("a.b", "*/30 * * * *", "Europe/Paris")
    spring = slots(schedule, at(2026, 3, 29, 0, 0), at(2026, 3, 29, 2, 0))  # 01:00-04:00 local
    assert spring == ["01:30CET", "03:00CEST", "03:30CEST"]  # the skipped hour has no slot
    autumn = slots(schedule, at(2026, 10, 24, 23, 0), at(2026, 10, 25, 2, 0))  # 01:00-03:00 CET
    assert autumn == ["01:30CEST", "02:00CEST", "02:30CEST", "02:00CET", "02:30CET"]  # both passes


@pytest.mark.parametrize("expression", ["30 2 * * *", "*/30 * * * *", "0 1-3 * * *"])
def test_latest_and_next_agree_across_dst_changes(expression):
    schedule = CronSchedule("a.b", expression, "Europe/Paris")
    for start in (at(2026, 3, 28, 20), at(2026, 10, 24, 20)):
        previous = schedule.latest_at(start)
        moment = start
        for _ in range(12):
            slot = schedule.next_after(moment)
            assert schedule.latest_at(slot) == slot
            assert schedule.latest_at(slot - dt.timedelta(seconds=1)) == previous
            previous, moment = slot, slot


def test_dst_in_the_second_pass_of_the_repeated_hour_the_days_fixed_time_is_past():
    # 2026-10-25 in Paris: at 02:10 CET (the second pass), the day's 02:30 slot ran
    # in the first pass, at 02:30 CEST. cronsim alone answers that slot as the next
    # one, and the day before's as the latest.
    schedule = CronSchedule("a.b", "30 2 * * *", "Europe/Paris")
    moment = at(2026, 10, 25, 1, 10)
    assert schedule.latest_at(moment) == at(2026, 10, 25, 0, 30)  # 02:30 CEST
    assert schedule.next_after(moment) == at(2026, 10, 26, 1, 30)  # tomorrow's 02:30 CET


# Around the clock going back in each zone (the UTC instant it does), the slots of that
# night as the schedule's argument shows them: a fixed time once, in the first pass;
# frequent slots (a `*` in the minute field) in both passes. Chatham goes back from
# 03:45 to 02:45, Lord Howe by half an hour, from 02:00 to 01:30 (so its wall clock
# reads 02:00 only once, after the repeated half hour).
FALL_BACKS = [
    ("Europe/Paris", "30 2 * * *", at(2026, 10, 25, 1), ["02:30+02:00"]),
    ("America/New_York", "30 1 * * *", at(2026, 11, 1, 6), ["01:30-04:00"]),
    ("Australia/Sydney", "30 2 * * *", at(2026, 4, 4, 16), ["02:30+11:00"]),
    ("Europe/Dublin", "30 1 * * *", at(2026, 10, 25, 1), ["01:30+01:00"]),
    ("America/Havana", "30 0 * * *", at(2026, 11, 1, 5), ["00:30-04:00"]),
    ("Australia/Lord_Howe", "45 1 * * *", at(2026, 4, 4, 15), ["01:45+11:00"]),
    (
        "Australia/Lord_Howe",
        "*/15 2 * * *",
        at(2026, 4, 4, 15),
        ["02:00+10:30", "02:15+10:30", "02:30+10:30", "02:45+10:30"],
    ),
    (
        "Pacific/Chatham",
        "*/15 2 * * *",
        at(2026, 4, 4, 14),
        ["02:00+13:45", "02:15+13:45", "02:30+13:45", "02:45+13:45", "02:45+12:45"],
    ),
    (
        "Pacific/Chatham",
        "*/15 3 * * *",
        at(2026, 4, 4, 14),
        [
            "03:00+13:45",
            "03:15+13:45",
            "03:30+13:45",
            "03:00+12:45",
            "03:15+12:45",
            "03:30+12:45",
            "03:45+12:45",
        ],
    ),
]


@pytest.mark.parametrize(("zone", "expression", "fall_back", "night"), FALL_BACKS)
def test_dst_next_and_latest_slots_hold_across_the_repeated_hour(zone, expression, fall_back, night):
    """What the starter relies on at any moment of that night: the next slot is
    ahead (or its loop would not sleep), the latest is not (or it would start a
    slot early), and none lies between the latest and now (or a restarted worker
    would skip the slot it missed)."""
    schedule = CronSchedule("a.b", expression, zone)
    start, end = fall_back - dt.timedelta(hours=2), fall_back + dt.timedelta(hours=2)
    chain, moment = [], start  # the slots a worker running through the night starts
    while (moment := schedule.next_after(moment)) <= end:
        chain.append(moment)
    assert [schedule.argument(slot).isoformat(timespec="minutes")[11:] for slot in chain] == night
    for minutes in range(0, 4 * 60 + 1, 5):
        for moment in (
            start + dt.timedelta(minutes=minutes, seconds=-1),
            start + dt.timedelta(minutes=minutes),
        ):
            latest, following = schedule.latest_at(moment), schedule.next_after(moment)
            assert latest <= moment < following, moment
            assert schedule.next_after(latest) == following, moment
            assert latest in chain or latest < start, moment
            assert following in chain or following > end, moment


def test_both_day_fields_restricted_match_if_either_matches_unless_one_starts_with_a_star():
    # Neither field starts with `*`: the 1st, the 15th, or a Monday.
    either = CronSchedule("a.b", "0 0 1,15 * MON")
    assert either.next_after(at(2026, 11, 30, 12)) == at(2026, 12, 1)  # a Tuesday, the 1st
    assert either.next_after(at(2026, 12, 1, 12)) == at(2026, 12, 7)  # a Monday
    # `*/2` starts with `*`: both must match (Debian's rule), a Monday on an odd day.
    both = CronSchedule("a.b", "0 0 */2 * MON")
    assert both.next_after(at(2026, 11, 30, 12)) == at(2026, 12, 7)  # not Tuesday the 1st
    # Odd days written without the star: either again.
    assert CronSchedule("a.b", "0 0 1-31/2 * MON").next_after(at(2026, 11, 30, 12)) == at(2026, 12, 1)


# cronsim's reverse iteration never returns around Chatham's fall-back for this
# expression (it is no longer used): each check runs in a child process, so that a
# hang fails the test instead of stopping the suite.
CHATHAM = """
import datetime as dt
from everystep.cron import CronSchedule
schedule = CronSchedule("shop.flows.every_two_hours", "0 */2 * * *", "Pacific/Chatham")
"""


def in_child(code: str) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHATHAM + code],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"did not return within 20 s (hung): {code}") from None
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def chatham(method: str, moment: str) -> str:
    return in_child(f"print(schedule.{method}(dt.datetime.fromisoformat({moment!r})).isoformat())")


def test_dst_every_two_hours_in_chatham_the_slot_due_before_fall_back_is_found():
    # 2026-04-05: 03:45 +13:45 goes back to 02:45 +12:45. The slot 02:00 +13:45 =
    # 12:15Z: the worker's loop asks latest_at() when it is due.
    assert chatham("latest_at", "2026-04-04T12:15:00+00:00") == "2026-04-04T12:15:00+00:00"


def test_dst_every_two_hours_in_chatham_the_next_slot_in_the_repeated_hour_is_found():
    # At 03:00 +12:45 (second pass) the next slot is 04:00 +12:45 = 15:15Z.
    assert chatham("next_after", "2026-04-04T14:15:00+00:00") == "2026-04-04T15:15:00+00:00"


def test_dst_every_two_hours_in_chatham_latest_and_next_agree_through_both_changes():
    # The night's slots from next_after(), and latest_at() just at and before each.
    # 2026-09-27: 02:45 +12:45 jumps to 03:45 +13:45, and 04:00 +13:45 has its slot.
    night = in_child("""
for change in (dt.datetime(2026, 4, 4, 14, tzinfo=dt.UTC), dt.datetime(2026, 9, 26, 14, tzinfo=dt.UTC)):
    moment = change - dt.timedelta(hours=6)
    previous = schedule.latest_at(moment)
    for _ in range(7):
        slot = schedule.next_after(moment)
        assert previous < slot and schedule.latest_at(slot) == slot
        assert schedule.latest_at(slot - dt.timedelta(seconds=1)) == previous
        print(schedule.argument(slot).isoformat(timespec="minutes")[11:])
        previous, moment = slot, slot
""")
    assert night.split() == [
        *["22:00+13:45", "00:00+13:45", "02:00+13:45", "04:00+12:45", "06:00+12:45", "08:00+12:45"],
        "10:00+12:45",
        *["22:00+12:45", "00:00+12:45", "02:00+12:45", "04:00+13:45", "06:00+13:45", "08:00+13:45"],
        "10:00+13:45",
    ]

# ---------------------------------------------------------------- starting slots


@pytest.mark.django_db
def test_a_new_schedule_starts_at_its_next_slot_not_one_before_it(declare):
    report = declare(cron="*/5 * * * *")
    starter, clock = started_at(report, at(2026, 3, 6, 9, 7, 30))
    assert runs_of(report) == []  # 09:05 came before this schedule ever ran
    assert starter.timeout(poll=600) == 150  # asleep until 09:10, not a poll interval
    assert starter.timeout(poll=0.2) == 0.2

    clock.set(2026, 3, 6, 9, 9, 59)
    assert starter.start_due() == 0
    clock.set(2026, 3, 6, 9, 10, 0, 3000)
    assert starter.start_due() == 1
    (run,) = runs_of(report)
    assert (run.idempotency_key, run.status) == ("cron:2026-03-06T09:10:00Z", "scheduled")
    assert run.args == [at(2026, 3, 6, 9, 10)]
    assert run_once(run).result == "2026-03-06T09:10:00+00:00"  # the workflow got its slot
    assert starter.timeout(poll=600) == pytest.approx(299.997)


@pytest.mark.django_db
def test_the_slot_argument_is_in_the_schedules_zone(declare):
    report = declare(cron="0 9 * * *", timezone="Europe/Paris")
    starter, clock = started_at(report, at(2026, 1, 10, 7, 0))
    clock.set(2026, 1, 10, 8, 0, 1)
    assert starter.start_due() == 1
    (run,) = runs_of(report)
    assert run.idempotency_key == "cron:2026-01-10T08:00:00Z"
    assert run_once(run).result == "2026-01-10T09:00:00+01:00"


@pytest.mark.django_db
def test_a_slot_already_started_by_another_worker_is_not_started_again(declare):
    report = declare(cron="*/5 * * * *")
    first, first_clock = started_at(report, at(2026, 3, 6, 9, 7), runner="w1")
    second, second_clock = started_at(report, at(2026, 3, 6, 9, 8), runner="w2")
    first_clock.set(2026, 3, 6, 9, 10, 0)
    second_clock.set(2026, 3, 6, 9, 10, 1)
    assert first.start_due() == 1
    assert second.start_due() == 0
    assert keys_of(report) == ["cron:2026-03-06T09:10:00Z"]


@pytest.mark.django_db
def test_after_downtime_only_the_latest_missed_slot_starts(declare, caplog):
    report = declare(cron="*/5 * * * *")
    before, clock = started_at(report, at(2026, 3, 6, 7, 58))
    clock.set(2026, 3, 6, 8, 0, 0)
    assert before.start_due() == 1  # the 08:00 slot ran; then every worker went away

    # A worker starts at 09:07: 08:05 ... 09:05 (13 slots) had no worker.
    with caplog.at_level(logging.INFO, logger="everystep"):
        after, clock = started_at(report, at(2026, 3, 6, 9, 7, 0), runner="back")
    assert keys_of(report) == ["cron:2026-03-06T08:00:00Z", "cron:2026-03-06T09:05:00Z"]
    assert "slot 2026-03-06T09:05:00Z started as run" in caplog.text
    assert "120.0s late; 12 missed slots before it skipped" in caplog.text

    # And on from there, slot by slot.
    assert after.start_due() == 0
    clock.set(2026, 3, 6, 9, 10, 0)
    assert after.start_due() == 1
    assert keys_of(report)[-1] == "cron:2026-03-06T09:10:00Z"


@pytest.mark.django_db
def test_a_restart_within_a_slot_already_started_starts_nothing(declare):
    report = declare(cron="*/5 * * * *")
    before, clock = started_at(report, at(2026, 3, 6, 9, 4))
    clock.set(2026, 3, 6, 9, 5, 0)
    assert before.start_due() == 1
    started_at(report, at(2026, 3, 6, 9, 7))  # the worker restarts: 09:05 has its run
    assert keys_of(report) == ["cron:2026-03-06T09:05:00Z"]


@pytest.mark.django_db
@pytest.mark.parametrize(("kept_status", "pruned_statuses"), [("blocked", None), ("failed", ["completed"])])
def test_a_restart_after_prune_does_not_start_an_already_run_slot_again(
    declare, kept_status, pruned_statuses
):
    digest = declare(cron="0 2 * * MON")  # weekly, Mondays 02:00 UTC
    name = digest.__everystep__.name
    # An old slot's run that prune keeps (its status is not pruned)...
    Workflow.objects.create(
        name=name,
        args=[at(2026, 3, 2, 2)],
        idempotency_key="cron:2026-03-02T02:00:00Z",
        status=kept_status,
        completed_at=at(2026, 3, 2, 2, 1),
    )
    # ...and the latest slot's run, which ran and completed: prune keeps it too, as
    # the workers' record of the last started slot.
    Workflow.objects.create(
        name=name,
        args=[at(2026, 3, 9, 2)],
        idempotency_key="cron:2026-03-09T02:00:00Z",
        status="completed",
        completed_at=at(2026, 3, 9, 2, 1),
    )
    assert operations.prune(older_than=dt.timedelta(days=1), statuses=pruned_statuses, dry_run=True) == 0
    assert operations.prune(older_than=dt.timedelta(days=1), statuses=pruned_statuses) == 0

    # A worker (re)starts on Wednesday: Monday's slot ran already; nothing is due.
    started_at(digest, at(2026, 3, 11, 10))
    assert keys_of(digest) == ["cron:2026-03-02T02:00:00Z", "cron:2026-03-09T02:00:00Z"]
    assert Workflow.objects.get(idempotency_key="cron:2026-03-09T02:00:00Z").status == "completed"


@pytest.mark.django_db
def test_prune_keeps_each_schedules_newest_slot_run_only(declare):
    daily = declare(cron="0 2 * * *")
    name = daily.__everystep__.name
    for day in range(1, 6):
        Workflow.objects.create(
            name=name,
            idempotency_key=f"cron:2026-03-0{day}T02:00:00Z",
            status="completed",
            completed_at=at(2026, 3, day, 2, 1),
        )
    Workflow.objects.create(name=name, status="completed", completed_at=at(2026, 3, 1))  # no slot's
    assert operations.prune(older_than=dt.timedelta(days=1), dry_run=True) == 5
    assert operations.prune(older_than=dt.timedelta(days=1), batch=2) == 5
    assert keys_of(daily) == ["cron:2026-03-05T02:00:00Z"]


@pytest.mark.django_db
def test_a_new_schedules_first_slot_started_on_time_is_not_reported_missed(declare):
    report = declare(cron="0 * * * *")  # hourly, declared at 09:30
    schedule = report.__everystep__.cron
    starter, clock = started_at(report, at(2026, 3, 6, 9, 30))  # a new schedule: nothing to catch up
    clock.set(2026, 3, 6, 10, 0)
    assert starter.start_due() == 1  # the 10:00 slot starts on time
    assert keys_of(report) == ["cron:2026-03-06T10:00:00Z"]

    # 09:00 predates the schedule: not missed, though older than MISSED_AFTER with no run.
    state = cron.state(schedule, at(2026, 3, 6, 10, 0, 10))
    assert state.latest_slot == at(2026, 3, 6, 10, 0)
    assert not state.missed
    # A slot after the last started one, without a run 30 s on, is.
    assert cron.state(schedule, at(2026, 3, 6, 11, 0, 31)).missed


@pytest.mark.django_db
def test_a_loop_held_up_past_several_slots_starts_the_latest_only(declare):
    report = declare(cron="*/5 * * * *")
    starter, clock = started_at(report, at(2026, 3, 6, 9, 7))
    clock.set(2026, 3, 6, 9, 27, 0)  # 09:10, 09:15, 09:20 passed while the loop was busy
    assert starter.start_due() == 1
    assert keys_of(report) == ["cron:2026-03-06T09:25:00Z"]


@pytest.mark.django_db
def test_slots_overlap_a_slot_starts_while_the_previous_one_still_runs(declare):
    report = declare(cron="*/5 * * * *")
    starter, clock = started_at(report, at(2026, 3, 6, 9, 7))
    clock.set(2026, 3, 6, 9, 10, 0)
    starter.start_due()
    Workflow.objects.filter(name=report.__everystep__.name).update(status="running", claimed_by="w9")
    clock.set(2026, 3, 6, 9, 15, 0)
    assert starter.start_due() == 1
    statuses = dict(
        Workflow.objects.filter(name=report.__everystep__.name).values_list("idempotency_key", "status")
    )
    assert statuses == {"cron:2026-03-06T09:10:00Z": "running", "cron:2026-03-06T09:15:00Z": "scheduled"}


def loop_until(starter, clock, until, *, poll=600):
    """A worker's loop between claims, on the test's clock, until ``until``: the
    times it started a slot at, and how many of its waits were 0s (each a turn
    spinning, a query each)."""
    started, spins = [], 0
    while clock.now < until:
        if starter.start_due():
            started.append(clock.now)
        wait = starter.timeout(poll)
        spins += wait == 0
        clock.now += dt.timedelta(seconds=max(wait, 1))
    return started, spins


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("ran_today", "up_at", "starts_at"),
    [
        (False, at(2026, 10, 24, 23, 0), [at(2026, 10, 25, 0, 30)]),  # through the night: on time
        (False, at(2026, 10, 25, 1, 10), [at(2026, 10, 25, 1, 10)]),  # back at 02:10 CET: caught up
        (True, at(2026, 10, 25, 1, 10), []),  # deployed at 02:10 CET: it ran at 02:30 CEST
    ],
)
def test_dst_a_worker_in_the_repeated_hour_starts_the_fixed_time_once_and_sleeps(
    declare, ran_today, up_at, starts_at
):
    # 2026-10-25 in Paris: 30 2 runs at 02:30 CEST (00:30Z), not again at 02:30 CET
    # (01:30Z). A worker (re)started between 02:00 and 02:30 CET catches it up if
    # it was missed, and sleeps until tomorrow's, instead of spinning to 02:30 CET.
    report = declare(cron="30 2 * * *", timezone="Europe/Paris")
    before, clock = started_at(report, at(2026, 10, 24, 0, 0))
    clock.set(2026, 10, 24, 0, 30, 0)
    assert before.start_due() == 1  # the day before's slot
    if ran_today:
        clock.set(2026, 10, 25, 0, 30, 0)
        assert before.start_due() == 1

    clock = Clock(up_at)
    starter = CronStarter([report.__everystep__.cron], runner="w2", now=clock)
    started, spins = loop_until(starter, clock, at(2026, 10, 25, 3, 0))
    assert (started, spins) == (starts_at, 0)
    assert keys_of(report) == ["cron:2026-10-24T00:30:00Z", "cron:2026-10-25T00:30:00Z"]
    assert starter.timeout(poll=86_400) == pytest.approx(
        (at(2026, 10, 26, 1, 30) - clock.now).total_seconds()
    )


@pytest.mark.django_db
def test_several_schedules_wake_the_loop_for_the_soonest(declare):
    hourly = declare(name="hourly", cron="0 * * * *")
    often = declare(name="often", cron="*/10 * * * *")
    clock = Clock(at(2026, 3, 6, 9, 1))
    starter = CronStarter(registry.schedules(), runner="w1", now=clock)
    assert starter.timeout(poll=3600) == 0  # the first check is due at once
    starter.start_due()
    assert starter.timeout(poll=3600) == 9 * 60
    clock.set(2026, 3, 6, 10, 0, 0)
    assert starter.start_due() == 2
    assert keys_of(hourly) == ["cron:2026-03-06T10:00:00Z"]
    assert keys_of(often) == ["cron:2026-03-06T10:00:00Z"]


@pytest.mark.django_db(transaction=True)  # the starter drops the broken connection
def test_a_database_error_is_logged_and_retried_with_back_off(declare, caplog):
    report = declare(cron="*/5 * * * *")
    clock = Clock(at(2026, 3, 6, 9, 7))
    starter = CronStarter([report.__everystep__.cron], runner="w1", now=clock)
    with (
        mock.patch.object(cron, "last_run", side_effect=OperationalError("server closed the connection")),
        caplog.at_level(logging.WARNING, logger="everystep"),
    ):
        assert starter.start_due() == 0  # no exception reaches the loop
        assert starter.timeout(poll=60) == pytest.approx(0.2)  # back off, not spin
        assert starter.start_due() == 0  # not before the back-off
    assert "cannot start cron slots (server closed the connection); retrying in 0.2s" in caplog.text
    clock.set(2026, 3, 6, 9, 7, 1)
    starter.start_due()  # the first check done now
    assert starter.timeout(poll=600) == 179


@pytest.mark.django_db(transaction=True)
def test_workers_racing_for_one_slot_start_it_once(declare):
    """Every racer reaches the slot's insert at once (a barrier); the unique key
    lets one insert win and each of the others find the winner's run."""
    report = declare(cron="*/5 * * * *")
    racers = 6
    clocks = [Clock(at(2026, 3, 6, 9, 7)) for _ in range(racers)]
    starters = [
        CronStarter([report.__everystep__.cron], runner=f"w{i}", now=clocks[i]) for i in range(racers)
    ]
    for starter in starters:
        starter.start_due()
    # SQLite's BEGIN IMMEDIATE serializes them anyway: no barrier there.
    barrier = threading.Barrier(racers if database.connection().vendor != "sqlite" else 1, timeout=30)
    inserted, errors = [], []

    def race(i):
        try:
            clocks[i].set(2026, 3, 6, 9, 10, 0)
            barrier.wait()
            inserted.append(starters[i].start_due())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    with mock.patch.object(cron.logger, "warning", side_effect=AssertionError):  # no swallowed error
        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert sorted(inserted) == [0] * (racers - 1) + [1]  # one winner, and it knows it
    assert keys_of(report) == ["cron:2026-03-06T09:10:00Z"]
    assert all(starter.timeout(poll=600) > 0 for starter in starters)  # all moved on to 09:15


@pytest.mark.django_db(transaction=True)
def test_workers_restarting_after_downtime_race_for_the_catch_up_slot_once(declare):
    report = declare(cron="*/5 * * * *")
    before, clock = started_at(report, at(2026, 3, 6, 7, 58))
    clock.set(2026, 3, 6, 8, 0, 0)
    before.start_due()
    racers = 6
    barrier = threading.Barrier(racers if database.connection().vendor != "sqlite" else 1, timeout=30)
    inserted, errors = [], []

    def restart(i):
        try:
            starter = CronStarter(
                [report.__everystep__.cron], runner=f"w{i}", now=lambda: at(2026, 3, 6, 9, 7)
            )
            barrier.wait()
            inserted.append(starter.start_due())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    with mock.patch.object(cron.logger, "warning", side_effect=AssertionError):
        threads = [threading.Thread(target=restart, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert sorted(inserted) == [0] * (racers - 1) + [1]
    assert keys_of(report) == ["cron:2026-03-06T08:00:00Z", "cron:2026-03-06T09:05:00Z"]


@pytest.mark.django_db(transaction=True)
def test_the_last_run_query_uses_an_index_on_a_big_table():
    if database.connection().vendor != "postgresql":
        pytest.skip("the plan checked is PostgreSQL's")
    start = at(2026, 1, 1)

    def key(minutes):
        return CronSchedule("a.b", "* * * * *").key(start + dt.timedelta(minutes=minutes))

    rows = [Workflow(name=f"shop.flows.f{i % 5}", idempotency_key=key(i)) for i in range(20_000)]
    rows += [Workflow(name="shop.flows.f0", idempotency_key=f"order-{i}") for i in range(5_000)]
    rows += [Workflow(name="shop.flows.rare", idempotency_key=key(i * 1440)) for i in range(5)]
    Workflow.objects.bulk_create(rows, batch_size=2_000)
    with database.connection().cursor() as cursor:
        cursor.execute("VACUUM ANALYZE everystep_workflow")
    for name, last in (("shop.flows.f0", key(19_995)), ("shop.flows.rare", key(4 * 1440))):
        query = Workflow.objects.filter(name=name, idempotency_key__startswith=cron.KEY_PREFIX)
        plan = query.order_by("-idempotency_key")[:1].explain()
        assert "Index Scan Backward" in plan and "Sort" not in plan, plan
        assert cron.last_run(name).idempotency_key == last
