"""filters"""
