"""The rollout page in a real browser (Debian's chromium, driven by selenium through Debian's
chromedriver): log in to the live Airflow UI with the simple auth manager, open "Rollout"
from the navigation (Browse), and read the channels, versions and history inside the UI's frame."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import HOSTILE_REASON

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists(),
                       reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"),
]


@pytest.fixture
def browser(tmp_path):
    selenium = pytest.importorskip("selenium", reason="needs selenium (requirements/main.in)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    del selenium
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_rollout_page_from_the_navigation(airflow_api, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    try:
        # the page itself sends an anonymous visitor to the login, and the login back to it
        browser.get(f"{airflow_api['url']}/onnxcast/rollout")
        wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys(airflow_api["user"])
        assert "/auth/login" in browser.current_url
        browser.find_element(By.NAME, "password").send_keys(airflow_api["password"])
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section.model[data-model='m']")))
        assert browser.current_url == f"{airflow_api['url']}/onnxcast/rollout"
        browser.get(f"{airflow_api['url']}/")
        # the UI's navigation: Browse -> Rollout (the plugin's external view)
        wait.until(ec.element_to_be_clickable((By.XPATH, "//*[@data-testid='nav-sidebar']//button[@aria-label='Browse']"))).click()
        wait.until(ec.element_to_be_clickable((By.XPATH, "//*[@role='menuitem'][normalize-space()='Rollout']"))).click()
        wait.until(ec.url_contains("/plugin/onnxcast-rollout"))
        frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/onnxcast/rollout']")))
        browser.switch_to.frame(frame)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section.model[data-model='m']")))
        boxes = {b.get_attribute("data-channel"): b for b in browser.find_elements(By.CSS_SELECTOR, "div.channel")}
        assert sorted(boxes) == ["canary", "cloud", "edge"]
        edge, cloud = boxes["edge"], boxes["cloud"]
        assert boxes["canary"].find_element(By.CSS_SELECTOR, ".device .bad").text == "refused"
        assert "unverified claim" in boxes["canary"].find_element(By.TAG_NAME, "h3").text
        assert edge.find_element(By.CSS_SELECTOR, "h3 .version").text == "1"
        assert cloud.find_element(By.CSS_SELECTOR, "h3 .version").text == "2"
        assert edge.find_element(By.CSS_SELECTOR, ".device .ok").text == "accepted"
        rows = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
                for row in edge.find_elements(By.CSS_SELECTOR, "table.history tr")[1:]]
        assert [(r[1], r[2], r[3]) for r in rows] == [("rollback", "1", "2"), ("promote", "2", "1"),
                                                     ("promote", "1", "-")]
        assert rows[0][5] == HOSTILE_REASON  # shown as text: the script tag did not run or vanish
        assert "admin" in rows[0][4]
        assert "MASE 0.97" in edge.find_element(By.CSS_SELECTOR, "td.monitor").text
        assert cloud.find_element(By.CSS_SELECTOR, "td.monitor").text == "not monitored yet"
        assert edge.find_element(By.CSS_SELECTOR, "td.rollout").text.startswith("deployed")
        link = edge.find_element(By.LINK_TEXT, "version 1")
        assert link.get_attribute("href") == "http://mlflow.example:5000/#/models/m/versions/1"
    except Exception:
        browser.switch_to.default_content()
        (tmp_path / "page.html").write_text(browser.page_source)
        browser.save_screenshot(str(tmp_path / "page.png"))
        print(f"browser state kept in {tmp_path} (page.html, page.png)")
        raise
