from harness.compare import compare_outputs


def test_equal_outputs_match():
    c = compare_outputs([1, 2, 3], [1, 2, 3], [-0.1, -0.2, -0.3], [-0.1, -0.25, -0.3])
    assert c.match and c.first_divergence is None
    assert abs(c.max_logprob_diff - 0.05) < 1e-9


def test_divergence_index_and_logprob_window():
    c = compare_outputs([1, 2, 3, 4], [1, 2, 9, 9], [-1.0, -1.0, -1.0, -5.0], [-1.0, -1.5, -0.7, -0.1])
    assert not c.match and c.first_divergence == 2
    # positions 0..2 count (2 is the first divergent one); position 3 is past it
    assert abs(c.max_logprob_diff - 0.5) < 1e-9


def test_length_mismatch_is_a_divergence():
    c = compare_outputs([1, 2, 3], [1, 2])
    assert not c.match and c.first_divergence == 2 and c.max_logprob_diff is None
