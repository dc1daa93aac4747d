"""The pipeline steps on one run folder: config, reading, quality, data, models, training,
export, optimize, evaluation (baselines, the statistical reference), metrics, validate,
report, and run (the steps in order). Never imports Airflow, MLflow or the rollout."""
