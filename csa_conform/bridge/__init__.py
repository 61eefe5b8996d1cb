"""The runtime's conformance bridge (specs/bridge.md): goldens exported as single-node ONNX models,
run one step per process by the runtime's own runner, its outputs judged bit for bit.

``nxrt`` is the runner's tensor file, ``model`` the ONNX node, ``export`` the two directory
layouts, ``protocol`` one runner process and its status line, ``replay`` a case's steps through it
(chained, and the FORCE_HOST differential), ``stand_in`` a runner that speaks the protocol with the
oracle, for tests and CI machines without the runtime.
"""
