import numpy as np
import pytest

from onnxcast.pipeline.metrics import forecast_metrics, mase_scale, seasonal_naive


def test_seasonal_naive_repeats_the_last_season():
    series = np.arange(100, dtype=float)
    forecast = seasonal_naive(series, np.array([50, 60]), horizon=5, season=3)
    # y[o+h] = y[o+h-3*(h//3+1)]: h=0,1,2 -> o-3..o-1 ; h=3,4 -> o-3, o-2
    assert forecast.tolist() == [[47, 48, 49, 47, 48], [57, 58, 59, 57, 58]]


def test_seasonal_naive_is_perfect_on_a_periodic_series():
    series = np.tile([1.0, 5.0, 2.0, 8.0], 30)
    origins = np.array([40, 53, 77])
    forecast = seasonal_naive(series, origins, horizon=9, season=4)
    actual = np.stack([series[o : o + 9] for o in origins])
    assert np.array_equal(forecast, actual)


def test_seasonal_naive_needs_history():
    with pytest.raises(ValueError, match="more rows before the first origin"):
        seasonal_naive(np.arange(10.0), np.array([2]), horizon=2, season=4)


def test_metrics_known_values():
    actual = np.array([[10.0, 20.0]])
    predicted = np.array([[12.0, 16.0]])
    m = forecast_metrics(actual, predicted, scale=2.0)
    assert m["mae"] == pytest.approx(3.0)
    assert m["rmse"] == pytest.approx(np.sqrt((4 + 16) / 2))
    assert m["smape"] == pytest.approx((200 * 2 / 22 + 200 * 4 / 36) / 2)
    assert m["mase"] == pytest.approx(1.5)


def test_smape_is_zero_when_both_are_zero_and_mase_scale_never_divides_by_zero():
    m = forecast_metrics(np.zeros((1, 3)), np.zeros((1, 3)), scale=1.0)
    assert m["smape"] == 0.0
    assert mase_scale(np.ones(50), 7) == 1.0  # constant training data: fall back to 1
    assert mase_scale(np.arange(20.0), 4) == pytest.approx(4.0)
