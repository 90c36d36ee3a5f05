"""Scheduling: the endpoint pool, scheduling profiles, the profile-handler loop and the router."""
