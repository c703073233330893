"""Sensors: on new loads (events commits) and on decided late event days."""
