from router.backends.cooldown import Cooldown


def test_cools_down_after_allowed_fails_and_recovers_on_time() -> None:
    c = Cooldown(allowed_fails=3, seconds=5)
    assert not c.failure(0) and not c.failure(1)
    assert c.failure(2)  # the third consecutive failure
    assert c.active(6.9) and not c.active(7.0)


def test_success_resets_the_count() -> None:
    c = Cooldown(allowed_fails=2, seconds=5)
    c.failure(0)
    c.success()
    assert not c.failure(1)
    assert not c.active(1)


def test_failures_during_cooldown_do_not_extend_it() -> None:
    c = Cooldown(allowed_fails=1, seconds=5)
    assert c.failure(0)
    assert not c.failure(3)
    assert not c.active(5)
