"""The commands (inspect, run, report, inject) and the machinery only they use (supervision of
run's tree, its log discipline, profiles). Each builds the model from its witnesses, runs the rules and
returns a Result; cli.py renders it."""
