"""Rewrite asserts in the shared step helpers so a wrong message shows both texts."""

import pytest

pytest.register_assert_rewrite("contract_steps")
