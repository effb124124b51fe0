def test_smoke(adapter_client):
    r = adapter_client.as_hpa("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app=llm-inference"})
    print(r.status_code, r.text[:2000])
    r = adapter_client.as_hpa("/apis/custom.metrics.k8s.io/v1beta2")
    print(r.status_code, r.text[:2000])
    assert 0
