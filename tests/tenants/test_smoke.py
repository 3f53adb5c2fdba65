def test_current_tenant_answers_for_the_key(client_a, tenant_a):
    response = client_a.get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json()["slug"] == tenant_a[0].slug
