from harness.records.compare import compare_outputs


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


def test_a_mismatch_at_a_near_tie_is_told_apart():
    """vLLM's check_logprobs_close: at the first differing token each engine's token is in the
    other's top-k. The tokens after it do not count (each engine continues its own text)."""
    base, other = [1, 2, 3, 4], [1, 2, 5, 6]
    base_top = [[1, 7], [2, 7], [3, 5], [4, 8]]
    other_top = [[1, 7], [2, 7], [5, 3], [6, 9]]
    c = compare_outputs(base, other, base_top=base_top, other_top=other_top)
    assert not c.match and c.first_divergence == 2 and c.near_tie is True
    # the decode engine's token was not even the baseline's runner-up: not a tie
    assert compare_outputs(base, [1, 2, 9, 6], base_top=base_top, other_top=[[1], [2], [9, 3], [6]]).near_tie is False
    # nor when only one side has the other's token
    assert compare_outputs(base, other, base_top=[[1], [2], [3, 7], [4]], other_top=other_top).near_tie is False
    # unknown without both sides' top-k, and meaningless for equal outputs or a shorter output
    assert compare_outputs(base, other).near_tie is None
    assert compare_outputs(base, base, base_top=base_top, other_top=base_top).near_tie is None
    assert compare_outputs(base, base[:2], base_top=base_top, other_top=base_top[:2]).near_tie is None


def test_the_serving_client_reads_top_k_ids_only_where_the_server_wrote_token_ids():
    """runner=serve's top-k come from the completions API (vLLM's return_tokens_as_token_ids);
    a server that writes token strings instead leaves them unknown: no near tie is told there."""
    from harness.serving.load import top_ids

    assert top_ids({"token_id:7": -0.5, "token_id:5": -1.0, "token_id:9": -3.0}) == [7, 5, 9]
    assert top_ids({" the": -0.5, "token_id:5": -1.0}) == [] and top_ids(None) == []
    assert compare_outputs([1, 2], [3, 2], base_top=[[1, 3]], other_top=[top_ids(None)]).near_tie is None
