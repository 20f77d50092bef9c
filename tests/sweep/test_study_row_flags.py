"""The MLflow study row counts its flagged trials (`flagged` and `study/n_flagged`), so a collapsed study whose trials
were all measured under load never reads "-" in the runs table's flagged column."""

from __future__ import annotations

import optuna

from pipeline.sweep import study_view


def test_the_study_row_carries_its_flagged_count():
    study = optuna.create_study(direction="maximize")
    for flagged in (1.0, 1.0, 0.0):
        t = study.ask()
        t.set_user_attr("flagged", flagged)
        t.set_user_attr("metrics", {"throughput_img_s": 100.0})
        study.tell(t, 0.5)
    m = study_view.study_metrics(study, n_skipped=0)
    assert m["flagged"] == 2 and m["study/n_flagged"] == 2 and m["study/n_complete"] == 3
    assert m["best_test_acc"] == 0.5 and "final_test_acc" not in m  # summary.json's name, not the trials' column
