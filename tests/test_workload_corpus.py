"""workload=corpus: prompts cut from the models' training text with its own continuation as the
reference, and the task score that compares an output with it (harness/records/accuracy.py)."""

import pytest

from harness.checks import load_tokenizer
from harness.records.accuracy import task_score
from harness.workload import WorkloadError, build_workload
from tests.conftest import ROOT
from tests.helpers.config import compose_job

TOKENIZER = load_tokenizer(str(ROOT / "models" / "tiny-llama"))


def corpus_workload(*overrides: str):
    return build_workload(compose_job(["workload=corpus", *overrides]).workload, TOKENIZER)


def test_each_prompt_is_the_text_from_a_seeded_offset_and_its_reference_what_follows():
    text = TOKENIZER((ROOT / "models" / "corpus" / "pydoc_topics.txt").read_text()).input_ids[1:]
    w = corpus_workload("workload.prompt_len=40", "workload.num_prompts=5", "sampling.max_tokens=12")
    assert len(w.prompts) == 5 and len({tuple(p.token_ids) for p in w.prompts}) == 5
    for p in w.prompts:
        assert len(p.token_ids) == 40 and p.token_ids[0] == TOKENIZER.bos_token_id and len(p.reference) == 12
        window = p.token_ids[1:] + p.reference  # one stretch of the text, as the model was trained on it
        assert any(text[i:i + len(window)] == window for i in range(len(text) - len(window) + 1))
    again = corpus_workload("workload.prompt_len=40", "workload.num_prompts=5", "sampling.max_tokens=12")
    assert [p.token_ids for p in again.prompts] == [p.token_ids for p in w.prompts]
    assert corpus_workload("workload.seed=1").prompts[0].token_ids != corpus_workload().prompts[0].token_ids


def test_a_corpus_too_short_or_a_prompt_too_short_is_refused(tmp_path):
    (tmp_path / "t.txt").write_text("def f(): pass")
    with pytest.raises(WorkloadError, match="too few for prompts of 256"):
        corpus_workload(f"workload.path={tmp_path / 't.txt'}")
    with pytest.raises(WorkloadError, match="workload.prompt_len must be >= 2"):
        corpus_workload("workload.prompt_len=1")


def test_the_task_score_is_the_share_of_positions_equal_to_the_reference():
    assert task_score([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert task_score([1, 2], [1, 2, 3, 4]) == 1.0  # over the shorter of the two
    assert task_score([5, 1, 2], [1, 2, 3]) == 0.0  # position by position: a shifted copy scores nothing
    assert task_score([1, 2], None) is None and task_score([], [1]) is None
