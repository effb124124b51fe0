"""MIG geometry: the one home of GPU models, MIG profiles and placement rules.

Shared by the exporter's simulator and the rightsizer (neither imports the other). Data lives in
:mod:`mig_geometry.catalogue`; :mod:`mig_geometry.placement` decides whether a layout fits and
where; :mod:`mig_geometry.layouts` enumerates every valid layout of a model.
"""
