"""Workflow bodies for the static graph tests (module level, so their source is readable).

``STRAIGHT_ARGS`` maps each straight-line workflow to the arguments it runs with;
the tests compare its static ids with the ids the runtime records. Each workflow
after it holds one construct the analysis must refuse.
"""

import contextlib
import functools

import everystep
from everystep import parallel, step, workflow
from tests.core import workflows as other

MODULE = __name__


@step
def charge(amount=1):
    return amount


@step
def notify(who="customer"):
    return f"told {who}"


@step(unsafe_to_repeat=True)
def ship():
    return "shipped"


def pay_and_tell(amount):
    """A plain helper: its steps count in the caller's scope."""
    charge(amount)
    return notify("payer")


def tell_twice():
    pay_and_tell(2)
    notify("again")


def pure(values):
    """Loops and conditions without steps leave the ids alone."""
    total = 0
    for value in values:
        if value > 0:
            total += value
    try:
        return int(total)
    except ValueError:
        return 0


class Billing:
    @classmethod
    def settle(cls, amount):
        charge(amount)
        return notify("billing")

    @staticmethod
    def refund(amount):
        return charge(-amount)

    def close(self):
        return ship()

    def close_via_self(self):
        return self.close()


billing = Billing()


def logged(func):
    """A decorator written in the project: the analysis follows its wrapper."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


@logged
def logged_helper():
    return notify("logged")


@functools.lru_cache
def cached_helper():
    return charge(1)


# ---------------------------------------------------------------- straight line


@workflow
def sequential(amount):
    charge(amount)
    notify("ops")
    return ship()


@workflow
def named():
    charge(1)
    notify(everystep_id="mail")
    return charge(3, everystep_id=None)


@workflow
def unnamed_fork():
    charge(1)
    parallel(lambda: charge(2), lambda: notify("b"))
    ship()


@workflow
def named_fork_with_sequence():
    notify("start")
    left, right = parallel([lambda: charge(1), notify], lambda: ship(), everystep_id="fan")
    return notify(everystep_id="done")


@workflow
def nested_forks():
    return parallel(
        lambda: parallel(lambda: charge(1), [notify, lambda: charge(2)]),
        notify,
        everystep_id=None,
    )


@workflow
def helpers():
    charge(1)
    pay_and_tell(5)
    parallel(tell_twice, lambda: pay_and_tell(3))
    ship()


@workflow
def step_functions_as_branches():
    everystep.parallel(charge, lambda: other.record("x"), [ship, notify])
    other.record("after")


@workflow
def inline_workflow():
    charge(1)
    sequential(2)
    notify()


@workflow
def busy_expressions(order):
    """Non-step code between steps: calls, methods, loops, conditions, comprehensions."""
    total = pure([item["price"] for item in order["items"]])
    label = f"{order.get('name', 'x').upper()}-{len(order['items'])}" if total else "none"
    receipt = notify(str(charge(total)))  # arguments run first: charge is 1, notify is 2
    with contextlib.suppress(KeyError):
        extra = {"label": label, "sorted": sorted(order["items"], key=lambda i: i["price"])}
    for item in order["items"]:
        item["seen"] = True
    if not extra:
        raise ValueError("no extra")
    parallel(lambda: notify(label), lambda: charge(total * 2), everystep_id="after")
    return receipt


@workflow
def evaluation_order():
    table = {charge(1): notify("value"), "after": charge(2)}  # 1, 2, 3: key, value, key
    table[charge(4)] = notify("assigned first")  # the value is 4, the key 5
    counts = {2: 0}
    counts[charge(2)] += charge(7)  # the target's index runs before the value: 6, 7
    text = f"{charge(8)}:{notify(everystep_id='fmt')}"  # 8, fmt
    if (seen := charge(10)) > 5:  # the test runs once: 10
        text += "!"
    parallel(lambda amount=charge(11): charge(amount))  # noqa: B008 defaults run first: 11, fork 12
    return [text, seen, counts[2], len(table)]


@workflow
def methods_and_decorators():
    Billing.settle(1)
    Billing.refund(2)
    billing.close()
    logged_helper()
    parallel(billing.close, notify)
    parallel()
    parallel([])
    return notify("end")


@workflow
def def_time_evaluation():
    """A def runs no body, but its defaults, then its annotations (in CPython's order)."""

    def inner(
        first: charge(5) = charge(1),  # noqa: B008
        /,
        second: charge(4) = charge(2),  # noqa: B008
        *rest: charge(6),
        key: charge(7) = charge(3),  # noqa: B008
        **more: charge(8),
    ) -> notify(everystep_id="returns"):
        return first

    return charge(10)


class Steps:
    """Steps kept on a class and called through it: each is a step, not a method to walk."""

    charge = charge

    @step
    def audit():
        return "audited"


@workflow
def steps_on_a_class():
    Steps.charge(2)
    Steps.audit()
    return notify()


STRAIGHT_ARGS = {
    sequential: (7,),
    named: (),
    unnamed_fork: (),
    named_fork_with_sequence: (),
    nested_forks: (),
    helpers: (),
    step_functions_as_branches: (),
    inline_workflow: (),
    busy_expressions: ({"name": "ada", "items": [{"price": 2}, {"price": 3}]},),
    evaluation_order: (),
    methods_and_decorators: (),
    def_time_evaluation: (),
    steps_on_a_class: (),
}


# ---------------------------------------------------------------- refused


@workflow
def loop(amounts):
    for amount in amounts:
        charge(amount)


@workflow
def while_loop():
    while charge(0):
        pass


@workflow
def condition(flag):
    charge(1)
    if flag:
        notify()


@workflow
def ternary(flag):
    return charge(1) if flag else notify()


@workflow
def short_circuit(flag):
    return flag and charge(1)


@workflow
def guarded():
    try:
        charge(1)
    except ValueError:
        notify("failed")


@workflow
def comprehension(amounts):
    return [charge(amount) for amount in amounts]


@workflow
def dynamic_id(name):
    charge(1, everystep_id=f"charge-{name}")


@workflow
def id_from_constant():
    charge(1, everystep_id=MODULE)


@workflow
def dotted_id():
    charge(1, everystep_id="a.b")


@workflow
def twice_named():
    charge(1, everystep_id="same")
    charge(2, everystep_id="same")


@workflow
def keyword_splat(options):
    charge(1, **options)


@workflow
def local_alias():
    pay = charge
    pay(1)


STEPS = {"charge": charge}


@workflow
def local_call():
    pay = STEPS["charge"]
    pay(1)


@workflow
def local_def_branch():
    def branch():
        charge(1)

    parallel(branch, notify)


@workflow
def method_as_value():
    return list(map(Billing.settle, [1, 2]))


@workflow
def method_through_self():
    billing.close_via_self()


@workflow
def library_wrapper():
    cached_helper()


@workflow
def generator_expression():
    return ",".join(notify(who) for who in ["a", "b"])


@workflow
def local_branch():
    branch = STEPS["charge"]
    parallel(branch, notify)


@workflow
def lambda_outside_parallel():
    later = lambda: charge(1)  # noqa: E731
    return later


@workflow
def through_getattr(name):
    getattr(other, name)("x")


@workflow
def starred_branches(amounts):
    parallel(*[functools.partial(charge, amount) for amount in amounts])


@workflow
def step_as_value(amounts):
    return list(map(charge, amounts))


@workflow
def assert_message():
    assert charge(1), notify("only if the assertion fails")
    return ship()


@workflow
def early_return(flag):
    if flag:
        return None
    charge(1)


def countdown(n):
    charge(n)
    countdown(n - 1)


@workflow
def recursive():
    countdown(3)


def generator_helper():
    yield charge(1)


@workflow
def lazy():
    return list(generator_helper())


class Notifier:
    def __call__(self, amount):
        return charge(amount)


class Audited:
    def __enter__(self):
        notify()
        return self

    def __exit__(self, *exc):
        return False


class Totals:
    @property
    def total(self):
        return charge(7)


notifier, audited, totals = Notifier(), Audited(), Totals()


@workflow
def callable_object():
    notifier(1)


@workflow
def context_manager_object():
    with audited:
        charge(1)


@workflow
def property_getter():
    return charge(totals.total)


# Hidden code that calls no step, through self (not followed): the graph stays exact.
class Settings:
    def _load(self):
        return {"rate": 3}

    @property
    def rate(self):
        return self._load()["rate"]


class Tracer:
    def _stop(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop()
        return False


class Formatter:
    def _fmt(self, value):
        return str(value)

    def __call__(self, value):
        return self._fmt(value)


class Singleton(type):
    instances: dict = {}

    def __call__(cls, *args, **kwargs):
        if cls not in Singleton.instances:
            Singleton.instances[cls] = super().__call__(*args, **kwargs)
        return Singleton.instances[cls]


class Client(metaclass=Singleton):
    rate = 2


settings, tracer, formatter = Settings(), Tracer(), Formatter()


@workflow
def reads_a_setting():
    return charge(settings.rate)


@workflow
def traced():
    with tracer:
        return charge(1)


@workflow
def formats():
    return charge(formatter(1))


@workflow
def singleton():
    return charge(Client().rate)

