"""Sample workflows showing every feature. Steps sleep a little so runs can be watched."""

import time

from everystep import Terminal, parallel, step, workflow
from everystep.errors import StepFailure

PACE = 0.4  # seconds per step, so that the UI shows runs in flight


def pause():
    time.sleep(PACE)


@step
def fetch_order(order_id):
    pause()
    return {"order_id": order_id, "items": ["book", "lamp"], "total": 42.5}


@step
def reserve_stock(item):
    pause()
    return {"item": item, "reservation": f"r-{item}"}


@step
def release_stock(reservation):
    pause()
    return {"released": reservation}


@step
def send_email(order_id, kind):
    pause()
    return f"{kind} email sent for order {order_id}"


@step
def pack(order_id):
    pause()
    return f"packed {order_id}"


@step
def print_label(order_id):
    pause()
    return f"label for {order_id}"


@step(unsafe_to_repeat=True)
def charge_card(order_id, amount):
    pause()
    if amount < 0:
        raise ValueError(f"cannot charge a negative amount ({amount})")
    return {"charged": amount, "order_id": order_id}


@step
def check_fraud(order_id):
    pause()
    if order_id % 5 == 0:
        raise Terminal("order flagged by the fraud check", {"order_id": order_id, "score": 0.97})
    return {"score": 0.02}


@step
def flaky_inventory_sync(order_id):
    """Fails on the first attempt, succeeds when an operator retries the run."""
    from demo_project.demo.models import Attempt

    pause()
    if Attempt.bump(f"inventory-sync-{order_id}") == 1:
        raise ConnectionError(f"inventory service timed out for order {order_id}")
    return {"synced": order_id}


@step
def summarise_day(day):
    time.sleep(5 * PACE)
    return {"day": day, "orders": 40 + day % 7}


@workflow
def sequential_order(order_id):
    """Steps one after another."""
    order = fetch_order(order_id)
    reserve_stock(order["items"][0])
    return send_email(order_id, "confirmation")


@workflow
def fan_out(order_id):
    """A parallel fork with a sequence branch, named fulfil."""
    order = fetch_order(order_id)
    emailed, shipped = parallel(
        lambda: send_email(order_id, "receipt"),
        [lambda: pack(order_id), lambda: print_label(order_id)],
        everystep_id="fulfil",
    )
    return {"order": order["order_id"], "emailed": emailed, "shipped": list(shipped)}


@workflow
def checkout_with_cleanup(order_id, amount):
    """Durable try/except: a failed charge releases the stock, also after a crash."""
    reservation = reserve_stock("book")
    try:
        charge_card(order_id, amount)
    except (ValueError, StepFailure) as exc:
        release_stock(reservation["reservation"])
        return {"outcome": "released", "why": str(exc)}
    return send_email(order_id, "receipt")


@workflow
def fraud_checked(order_id):
    """Orders divisible by 5 are stopped by a Terminal."""
    check_fraud(order_id)
    return send_email(order_id, "confirmation")


@workflow
def inventory_sync(order_id):
    """Fails once: press Retry in the UI and it completes."""
    fetch_order(order_id)
    flaky_inventory_sync(order_id)
    return send_email(order_id, "inventory updated")


@workflow
def nightly_report(days):
    """Slow on purpose (2 s a step): watch its tree grow, then try Stop or Requeue on it."""
    totals = [summarise_day(day) for day in range(1, days + 1)]
    return {"days": days, "orders": sum(total["orders"] for total in totals)}
