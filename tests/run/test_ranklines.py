"""torchrun's --tee'd log back into each rank's whole lines (mininet_topos.rankerrors.RankLines): its
tail of a rank's output prints a line the rank has not ended yet, and the rest later, each piece
prefixed. Under load this split rank 0's first JSON line and the run's loss curve lost its step 0."""
from __future__ import annotations

from mininet_topos.progress import Progress
from mininet_topos.rankerrors import RankLines, last_words


def ranks_lines(log: list[str]) -> list[tuple[int | None, str]]:
    split = RankLines()
    return [piece for line in log for piece in split.feed(line)]


def test_a_line_split_by_torchrun_s_tail_comes_back_whole_and_feeds_the_curve():
    log = ['[default0]:{"step": 0, "loss": 2.3108}[default0]:',  # as a loaded run's torchrun.log held it
           '[default0]:{"step": 1, "loss": 2.3117}']
    lines = ranks_lines(log)
    assert lines == [(0, '{"step": 0, "loss": 2.3108}'), (0, '{"step": 1, "loss": 2.3117}')]
    progress = Progress({1: 2}, 2)
    assert all(progress.feed_output(text) for _, text in lines)
    assert progress.curves[1].steps == [0, 1]


def test_pieces_of_several_ranks_are_joined_rank_by_rank_across_lines():
    log = ['[default0]:{"lo[default1]:hello',  # rank 0's line open, rank 1's ends this line
           "[default1]:wor[default0]:ss\": 1}",  # rank 1's open, rank 0's ends
           "[default1]:ld"]
    assert ranks_lines(log) == [(1, "hello"), (0, '{"loss": 1}'), (1, "world")]


def test_whole_lines_and_torchrun_s_own_lines_pass_as_they_are():
    log = ["[default1]:plain text", "W1204 torchrun's own warning", "[default0]:", "[default0]:  indented"]
    assert ranks_lines(log) == [(1, "plain text"), (None, "W1204 torchrun's own warning"), (0, ""),
                                (0, "  indented")]


def test_last_words_reads_a_split_line_whole():
    log = ["[default1]:Traceback (most recent call last):", '[default1]:  File "x.py", line 1',
           "[default1]:KeyError: [default0]:other rank", "[default1]:'x'"]
    assert last_words(log, 1) == "KeyError: 'x'"
    assert last_words(log, 0) == "other rank"
