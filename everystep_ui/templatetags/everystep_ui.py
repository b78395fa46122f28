"""``{% step_tree tree %}``: the run page's dotpath tree as nested lists.

Written in Python rather than as a template because a run can have thousands of
steps and is re-rendered on every poll: per node, Django's template engine
spends about a tenth of a millisecond and ``format_html`` tens of microseconds,
``html.escape`` and an f-string about one. What is the same for many nodes (the
step URL, a function name with its status badge) is escaped once per page.
"""

from html import escape

from django import template
from django.utils.safestring import mark_safe

register = template.Library()


@register.simple_tag
def step_tree(tree):
    # Nodes come in pre-order: a node with children opens a nested list, and
    # node.closes ends the lists that finish after it.
    url_pattern = escape(tree.step_url)
    labels: dict[tuple[str, str], str] = {}  # (status, function name) -> its HTML
    parts = ['<ul class="es-tree" hx-swap="innerHTML">']
    for node in tree.nodes:
        path = escape(node.path)
        kind = node.kind
        if kind == "step":
            label = labels.get((node.status, node.name))
            if label is None:
                label = labels[node.status, node.name] = step_label(node)
        elif kind == "fork":
            label = '<span class="es-kind">parallel</span>'
        else:
            label = f'<span class="es-kind">branch {escape(node.key)}</span>'
        parts.append(
            f'<li class="es-node es-{kind}"><div class="es-node-line">'
            f'<code class="es-path">{path}</code> {label}</div>'
        )
        if node.step_pk is not None:
            parts.append(payload_panel(int(node.step_pk), path, url_pattern))
        parts.append("<ul>" if node.children else "</li>")
        parts.append("</ul></li>" * node.closes)
    parts.append("</ul>")
    return mark_safe("".join(parts))  # every stored value went through escape()


def step_label(node) -> str:
    return (
        f'<span class="es-badge es-status-{escape(node.status)}">'
        f"{escape(node.status_label)}</span> "
        f'<code class="es-func">{escape(node.name)}</code>'
    )


def payload_panel(step_pk: int, path: str, url_pattern: str) -> str:
    """A recorded step's payloads: loaded when the panel is first opened;
    hx-preserve keeps an opened panel across polls; without JavaScript the link
    opens the step page. ``path`` and ``url_pattern`` are escaped already."""
    url = url_pattern.replace("STEP_PK", str(step_pk))
    return (
        f'<details id="es-step-{step_pk}" class="es-panel" hx-preserve="true" '
        f'hx-get="{url}" hx-trigger="toggle once" hx-target="find .es-payload">'
        "<summary>args, kwargs, result, error</summary>"
        f'<div class="es-payload"><a href="{url}">Open the payloads of step {path}</a></div>'
        "</details>"
    )
