"""Workflows whose structure the run page derives statically (everystep.graph)."""

from everystep import parallel, step, workflow


@step
def reserve(order_id):
    return order_id


@step
def charge(order_id):
    return order_id


@step
def email(order_id):
    return order_id


@step
def ship(order_id):
    return order_id


@workflow
def checkout(order_id):
    reserve(order_id)
    parallel(lambda: charge(order_id), lambda: email(order_id))
    ship(order_id)


@workflow
def ship_each(order_ids):
    for order_id in order_ids:
        ship(order_id)
