from everystep import step, workflow


@step
def pick(order_id):
    return {"order": order_id, "picked": ["book", "lamp"]}


@step
def label(picked):
    return f"order {picked['order']}: {', '.join(picked['picked'])}"


@workflow
def fulfil(order_id):
    return label(pick(order_id))
