import airflow_support

airflow_support.configure()
