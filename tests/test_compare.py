"""helpers.compare: flattening weights and the largest difference between two sets of them."""

import pytest
import torch
from torch import nn

from helpers.compare import flat, max_diff


def test_flat_takes_a_modules_parameters_in_order_as_float64():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    vector = flat(layer)
    assert vector.dtype == torch.float64 and vector.shape == (8,)
    assert torch.equal(vector[:6], layer.weight.detach().double().flatten())


def test_max_diff_finds_the_one_changed_value():
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert max_diff(a, b) == 0.0
    with torch.no_grad():
        b.bias[1] += 0.25
    assert max_diff(a, b) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="cannot compare 8 values with 3"):
        max_diff(a, [torch.zeros(3)])
