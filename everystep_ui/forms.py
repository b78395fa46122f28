"""The forms the operator actions post."""

import uuid6
from django import forms

from everystep import children, operations, serde
from everystep.errors import EverystepError
from everystep.models import Step, Wait, Workflow


def unstorable(value) -> str:
    """Why the engine would refuse to store ``value`` (empty if it would not).

    Valid JSON can still hold what serde refuses (a NUL or a lone surrogate in
    its text: ``"\\u0000"``); encoding it here shows that next to the field,
    not as a message after the operation refused it. What only the database
    refuses (MariaDB's JSON check: nesting past 32 levels) the operation
    reports as ``errors.RefusedByDatabase``, shown next to the field too.
    """
    try:
        serde.encode(value)
    except EverystepError as exc:
        return f"Cannot be stored: {exc}"
    return ""


class RunActionForm(forms.Form):
    """Every action posts the status the operator saw: the transition is
    conditional on it, so a run that moved on meanwhile is left alone."""

    seen_status = forms.ChoiceField(choices=Workflow.Status.choices, widget=forms.HiddenInput)

    def __init__(self, data=None, *, run: Workflow):
        super().__init__(data, initial=self.seen(run))
        self.run = run

    def seen(self, run) -> dict:
        return {"seen_status": run.status}

    def moved_on(self) -> str:
        """How the run differs from what the operator saw (empty if it does not)."""
        seen = self.data.get("seen_status")
        return f"it is {self.run.status} now, not {seen}" if seen and seen != self.run.status else ""


class StopForm(RunActionForm):
    """Stop offers to stop the run's unfinished child runs too (and theirs),
    when it has any: each is stopped only if it is still as it was read."""

    stop_children = forms.BooleanField(required=False)

    def __init__(self, data=None, *, run: Workflow):
        super().__init__(data, run=run)
        self.descendants = children.unfinished_descendants(run.pk)
        count = len(self.descendants)
        if count:
            self.fields["stop_children"].label = (
                f"Also stop its {count} unfinished child run{'s' if count > 1 else ''} "
                "(started with start_child, and their own children)"
            )
        else:
            del self.fields["stop_children"]


class SendEventForm(RunActionForm):
    """The event's key and its value as JSON; the key the run waits for, if
    it waits for one, is filled in."""

    # Not stripped: "approved " is a key of its own to the engine, and the
    # one filled in must be sent as it is.
    key = forms.CharField(
        label="Key", max_length=255, strip=False, widget=forms.TextInput(attrs={"size": 40}),
        help_text="The key the workflow waits for with wait_for_event().",
    )
    value = forms.CharField(
        label="Value (JSON)",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": '{"approved": true}'}),
        help_text="What wait_for_event() returns, as JSON: an object, a list, a string in quotes, "
        "a number, true, false or null.",
    )

    def __init__(self, data=None, *, run: Workflow):
        super().__init__(data, run=run)
        awaited = Wait.objects.filter(run_id=run.pk, kind=Wait.Kind.EVENT).values_list("key", flat=True)
        awaited = awaited.first()
        if awaited:
            self.fields["key"].initial = awaited

    def clean_value(self):
        text = self.cleaned_data["value"]
        try:
            value = serde.loads(text)
        except (ValueError, EverystepError) as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None
        if problem := unstorable(value):
            raise forms.ValidationError(problem)
        return value


class RequeueForm(RunActionForm):
    """Requeue also carries the claimer seen: a run another worker claimed since
    is healthy, and requeueing it would fence that worker out."""

    # Not stripped: a worker may be named "worker-1 ", and the guarded requeue
    # matches the claimer exactly.
    seen_claimer = forms.CharField(required=False, strip=False, widget=forms.HiddenInput)

    def seen(self, run) -> dict:
        return {**super().seen(run), "seen_claimer": run.claimed_by}

    def moved_on(self) -> str:
        status_changed = super().moved_on()
        seen = self.data.get("seen_claimer")
        if status_changed or not seen or seen == self.run.claimed_by:
            return status_changed
        return f"it is running under {self.run.claimed_by} now, not {seen}"

    def clean(self):
        # Empty is a claimer seen (none); missing would requeue whoever runs it now.
        if "seen_claimer" not in self.data:
            raise forms.ValidationError(
                "The form does not say which worker you saw running the run; nothing was changed. "
                "Reload the page and confirm again."
            )
        return super().clean()


class SeenMarkForm(RunActionForm):
    """Also carries ``seen_mark``, naming the rows the confirmation showed
    (``mark``). The operation, passed it as ``expected_mark``, checks it again
    under the run row's lock: rows changed meanwhile are left alone, also when
    the run came back to the status seen (another operator acted)."""

    # Not stripped: a mark is compared exactly.
    seen_mark = forms.CharField(required=False, strip=False, widget=forms.HiddenInput)

    def mark(self, run) -> str:
        raise NotImplementedError

    def clean(self):
        # Missing (a page from before marks, a hand-made post): it would act unchecked.
        if not self.data.get("seen_mark"):
            raise forms.ValidationError(
                "The form does not say which rows you were shown; nothing was changed. "
                "Reload the page and confirm again."
            )
        return super().clean()

    def seen(self, run) -> dict:
        return {**super().seen(run), "seen_mark": self.mark(run)}


class RetryForm(SeenMarkForm):
    """Retry carries the rows it lists as discarded (``discarded``)."""

    def __init__(self, data=None, *, run: Workflow):
        self.discarded = operations.retry_preview(run.pk)
        super().__init__(data, run=run)

    def mark(self, run) -> str:
        return operations.retry_mark(self.discarded, run.completed_at)


class WakeForm(SeenMarkForm):
    """Wake now carries the waits it shows."""

    def mark(self, run) -> str:
        return operations.waits_mark(run.pk)


class StepCutForm(SeenMarkForm):
    """Re-run from a step and Fork from a step also carry the step rows as
    shown (``seen_mark``: how many, and the last one's id), so that a history
    changed meanwhile is left alone. When the cut leaves out unsafe-to-repeat
    steps, a second confirmation names them and must be ticked."""

    confirm_unsafe = forms.BooleanField(required=False)

    def __init__(self, data=None, *, run: Workflow, step: Step, cut=None):
        self.step, self.cut = step, cut
        super().__init__(data, run=run)
        unsafe = cut.unsafe if cut is not None else ()
        if unsafe:
            names = ", ".join(f"{row.named} (step {row.step_id})" for row in unsafe)
            what = "this unsafe-to-repeat step" if len(unsafe) == 1 else "these unsafe-to-repeat steps"
            self.fields["confirm_unsafe"].label = (
                f"Yes, run {what} again, although its effect may happen twice: {names}"
                if len(unsafe) == 1
                else f"Yes, run {what} again, although their effects may happen twice: {names}"
            )
        else:
            del self.fields["confirm_unsafe"]

    def mark(self, run) -> str:
        return self.cut.mark if self.cut is not None else ""

    def moved_on(self) -> str:
        status_changed = super().moved_on()
        seen = self.data.get("seen_mark")
        if status_changed or not seen or self.cut is None or seen == self.cut.mark:
            return status_changed
        return "its recorded steps changed since they were shown"

    def clean(self):
        data = super().clean()
        if "confirm_unsafe" in self.fields and not data.get("confirm_unsafe"):
            self.add_error(
                "confirm_unsafe",
                "Tick this to confirm that these unsafe-to-repeat steps run again, or cancel.",
            )
        return data

    def seen_cut(self, seen_status: str) -> dict:
        """The keyword arguments of ``rerun_from_step``/``fork_from_step`` that
        make it conditional on what the operator saw and confirmed."""
        return {
            "expected_status": seen_status,
            "expected_mark": self.cleaned_data["seen_mark"],
            "confirm_unsafe": self.cleaned_data.get("confirm_unsafe", False),
        }


class ForkForm(StepCutForm):
    """Fork from a step also carries the new run's id, chosen when the
    confirmation is shown: the form posted twice makes one fork."""

    fork_id = forms.UUIDField(widget=forms.HiddenInput)

    def seen(self, run) -> dict:
        return {**super().seen(run), "fork_id": uuid6.uuid7()}

    def seen_cut(self, seen_status: str) -> dict:
        return {**super().seen_cut(seen_status), "fork_id": self.cleaned_data["fork_id"]}


class ResolveForm(SeenMarkForm):
    """The three choices of ``everystep_resolve_step``, with the same
    validation; it carries the started rows it offers."""

    RESOLUTIONS = [
        ("result", "The effect happened: record the step as done with this result"),
        ("error", "The effect did not happen: record the step as failed with this message"),
        ("discard", "Forget the started record: the step runs again"),
    ]

    step_id = forms.ChoiceField(label="Step")
    resolution = forms.ChoiceField(label="Outcome", choices=RESOLUTIONS, widget=forms.RadioSelect)
    result = forms.CharField(
        label="Result (JSON)",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": '{"charged": 1999}'}),
        help_text="What the step returned, as JSON: an object, a list, a string in quotes, a number or null.",
    )
    error = forms.CharField(
        label="Error message",
        required=False,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Recorded as a StepFailure: the workflow's except clauses see it on the next pass.",
    )

    def __init__(self, data=None, *, run: Workflow):
        self.started = list(operations.resolvable_steps(run.pk).values_list("id", "step_id", "name"))
        super().__init__(data, run=run)
        steps = [(step_id, name) for _, step_id, name in self.started]
        self.fields["step_id"].choices = [(step_id, f"{step_id} ({name})") for step_id, name in steps]
        if len(steps) == 1:
            self.fields["step_id"].initial = steps[0][0]

    def mark(self, run) -> str:
        return operations.mark_of(pk for pk, _, _ in self.started)

    def clean(self):
        data = super().clean()
        resolution = data.get("resolution")
        if resolution == "result":
            text = data.get("result") or ""
            try:
                data["value"] = serde.loads(text)
            except (ValueError, EverystepError) as exc:
                problem = str(exc) if text.strip() else "it is empty (null if the step returned nothing)"
                self.add_error("result", f"Not valid JSON: {problem}")
            else:
                if problem := unstorable(data["value"]):
                    self.add_error("result", problem)
        elif resolution == "error" and not data.get("error"):
            self.add_error("error", "Enter the message to record with the failure.")
        return data

    def resolve_kwargs(self) -> dict:
        """Keyword arguments for ``operations.resolve_step``."""
        choice = self.cleaned_data["resolution"]
        if choice == "result":
            return {"result": self.cleaned_data["value"]}
        if choice == "error":
            return {"error": self.cleaned_data["error"]}
        return {"discard": True}
