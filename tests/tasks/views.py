"""A view that enqueues a task in its transaction, as a project's would."""

import datetime as dt
import uuid

from django.db import transaction
from django.http import JsonResponse
from django.urls import path

from tests.tasks import jobs


def book(request):
    with transaction.atomic():
        result = jobs.add_days.enqueue(
            dt.date.fromisoformat(request.POST["day"]),
            int(request.POST["days"]),
            token=uuid.UUID(request.POST["token"]),
            blob=request.POST["note"].encode(),
        )
    return JsonResponse({"id": result.id, "status": result.status})


urlpatterns = [path("book/", book)]
