from django.db import models


class Attempt(models.Model):
    """How often a demo step was tried, so that a step can fail once and then succeed."""

    key = models.CharField(max_length=100, unique=True)
    count = models.PositiveIntegerField(default=0)

    def __str__(self):
        return f"{self.key}: {self.count}"

    @classmethod
    def bump(cls, key: str) -> int:
        attempt, _ = cls.objects.get_or_create(key=key)
        cls.objects.filter(pk=attempt.pk).update(count=models.F("count") + 1)
        return attempt.count + 1
