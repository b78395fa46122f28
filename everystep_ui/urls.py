app_name = "everystep_ui"
urlpatterns = []
