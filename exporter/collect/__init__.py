"""The collection loop: a backend read on a deadline → snapshot → attribution → families → one rendered page."""
