"""pickers"""
