"""DP-AdamBC (``dppo.algos.dp_adam``): Adam without noise; the noise variance out of the second moment."""
import torch


def test_adam_bc_is_adam_without_noise_and_takes_the_noise_variance_out_of_the_second_moment():
    """AdamBC with noise_var = 0 steps as torch's Adam; with noise_var = s^2 its step is
    m_hat / (sqrt(max(v_hat - s^2, (0.1 s)^2)) + eps), computed here by hand."""
    from dppo.algos.dp_adam import AdamBC

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, generator=g, dtype=torch.float64) for _ in range(4)]
    a, b = torch.zeros(5, dtype=torch.float64, requires_grad=True), torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt_a, opt_b = torch.optim.Adam([a], lr=0.1), AdamBC([b], lr=0.1)
    for gr in grads:
        a.grad, b.grad = gr.clone(), gr.clone()
        opt_a.step()
        opt_b.step()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    c = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt_c = AdamBC([c], lr=0.1)
    opt_c.noise_var = s2 = 0.5
    m = v = torch.zeros(5, dtype=torch.float64)
    expect = torch.zeros(5, dtype=torch.float64)
    for t, gr in enumerate(grads, 1):
        c.grad = gr.clone()
        opt_c.step()
        m, v = 0.9 * m + 0.1 * gr, 0.999 * v + 0.001 * gr ** 2
        m_hat, v_hat = m / (1 - 0.9 ** t), v / (1 - 0.999 ** t)
        expect = expect - 0.1 * m_hat / ((v_hat - s2).clamp_min(0.01 * s2).sqrt() + 1e-8)
    torch.testing.assert_close(c.detach(), expect, rtol=1e-10, atol=1e-12)
