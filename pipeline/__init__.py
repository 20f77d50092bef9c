"""Parallax: which data-parallel training strategy scales best on this host, and what each costs per device."""
